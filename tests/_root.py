"""The repository's root, for the tests that run scripts or read files of it
(the test files live in folders below tests/, this helper in tests/)."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
