"""APIs that are not yet stable. Anything here may change without notice; the API spec
lists it marked [unstable]. Stable APIs graduate to their home module."""

__all__: list[str] = []
