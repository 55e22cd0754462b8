import pytest

from pecli.runs.errors import ConfigError
from pecli.runs.registry import Registry


def test_get_and_suggestion():
    reg: Registry[int] = Registry("thing", ConfigError)
    reg.add("linear", 1)
    reg.add("exponential", 2)
    assert reg.get("linear") == 1
    with pytest.raises(ConfigError, match=r"unknown thing 'lineer' \(did you mean 'linear'\?\)"):
        reg.get("lineer")


def test_double_registration_is_a_bug():
    reg: Registry[int] = Registry("thing")
    reg.add("a", 1)
    with pytest.raises(ValueError):
        reg.add("a", 2)
