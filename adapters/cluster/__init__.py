"""Scale out: several replicas of the engine behind a prefix-aware router.

Each replica is one of the adapters' servers (BentoML or LitServe) publishing its prefix
cache's KV events (``kv_events_config``, vLLM's wire format); the router is vllm-router
(``pip install 'paged-core[router]'``), whose ``kv_aware`` policy subscribes to every
replica's events, asks a replica for a request's tokens (``/v1/completions/render``) and
sends the request where most of its prefix is already cached. paged-core writes only the
glue: ports, settings and process lifetimes (``running_cluster``; ``paged-core
serve-cluster`` runs it in the foreground).
"""
from .launch import Cluster, running_cluster, serve_cluster
from .router import POLICIES

__all__ = ["Cluster", "POLICIES", "running_cluster", "serve_cluster"]
