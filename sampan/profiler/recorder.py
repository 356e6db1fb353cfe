"""Moved to `sampan._recorder` (a low utility, below every floor that uses it); this old
path names the same module object, so its state and monkeypatches are shared."""
import sys

from .. import _recorder as _moved

sys.modules[__name__] = _moved
