"""User-facing errors: the CLI prints these as one line and exits non-zero."""


class UserError(ValueError):
    """Bad input from the user (a file, a flag, a language code); the message names the input."""


class Interrupted(BaseException):
    """The run was stopped by a signal (SIGTERM, SIGINT); the CLI exits with ``128 + signum``.

    A BaseException, like KeyboardInterrupt, so that ``except Exception`` in stage code does not swallow it.
    """

    def __init__(self, signum: int) -> None:
        import signal

        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum
