"""The zero-cost model lives in :mod:`realtime.models.fake`; this name stays for old imports."""

from realtime.models.fake import NullModel, NullSession

__all__ = ["NullModel", "NullSession"]
