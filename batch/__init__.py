"""The batch service: ``/v1/batches`` and ``/v1/files`` (OpenAI's batch API) and the worker that
runs batch lines through the platform on idle capacity, at tier ``batch``."""
