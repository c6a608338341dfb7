"""Errors the command line reports without a traceback."""


class UserError(Exception):
    """A mistake the user can fix; printed as one line, exit status 2."""
