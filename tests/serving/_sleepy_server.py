"""`sampan serve` in a subprocess with the test kind "test_sleepy" registered:
python -m tests.serving._sleepy_server <serve args...>"""
import sys

from tests.serving import _models  # noqa: F401  (registers the kind)

from sampan.cli import main

if __name__ == "__main__":
    sys.exit(main(["serve"] + sys.argv[1:]))
