"""The fake model lives in the package now (:mod:`realtime.models.fake`); tests import it here."""

from realtime.models.fake import FakeModel, FakeOptions, FakeSession

__all__ = ["FakeModel", "FakeOptions", "FakeSession"]
