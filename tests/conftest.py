"""Shared test set-up: lets tests import the scenario helpers beside them."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
