"""The one error type of the devices part."""

from ..errors import HamidError


class DeviceError(HamidError):
    """A device could not be read, or a device operation was refused."""
