"""The front end: input processing and detokenization."""
