"""Operations helpers: the `make run` supervisor and the services it (and the tests) start."""
