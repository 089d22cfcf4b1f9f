"""Support for tests, samples and benchmarks: writers of synthetic inputs."""
