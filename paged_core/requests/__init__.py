"""A request's forms: as the front end hands it to the core (``engine_io.EngineRequest``),
as the core runs it (``core_request.CoreRequest``: a sampling ``sampling_request.Request``
or a ``beam_search_request.BeamSearchRequest``), as the core reports on it
(``engine_io.EngineCoreOutput``)."""
