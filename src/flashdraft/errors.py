"""The one exception type for bad user input: the command line prints it and exits non-zero."""


class UserError(Exception):
    """Input that cannot work. The message names the problem and how to fix it."""
