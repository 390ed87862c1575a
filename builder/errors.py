"""One exception family; each kind maps to an exit code. Only cli.main() prints and exits."""


class BuilderError(Exception):
    """Base class. `exit_code` tells the shell what kind of failure this was."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} — {self.hint}"


class UserError(BuilderError):
    """Bad input: the matrix, a flag, a tag selection. The user must change something."""

    exit_code = 2


class MatrixError(UserError):
    """The matrix file is invalid. Message names file, tag, field and YAML line."""


class CompatError(UserError):
    """A combination breaks a compatibility rule."""


class EnvironmentProblem(BuilderError):
    """The machine lacks something (Docker engine, BuildKit, a base image, disk)."""

    exit_code = 3


class StepFailed(BuilderError):
    """A pipeline step ran and failed (build error, failed gate, refused publish)."""

    exit_code = 1
