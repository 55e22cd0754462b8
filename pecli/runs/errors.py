"""Errors a user can fix. `cli.main` prints their message on one line and exits 1."""


class PecliError(Exception):
    """Base class: the message says what went wrong and what to do."""


class ConfigError(PecliError):
    pass


class ModelError(PecliError):
    pass


class ArchSpecError(ModelError):
    pass


class DataError(PecliError):
    pass


class DeviceError(PecliError):
    pass


class InterventionError(PecliError):
    pass


class OutputError(PecliError):
    pass
