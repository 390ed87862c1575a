"""Run at every Python start in the image (site-packages/train-image-env.pth, site's standard hook), for a process
the image could not otherwise serve: an arbitrary UID with no passwd entry (OpenShift, `docker run --user 12345`)
and a home it cannot write (HOME=/ or /nonexistent, a read-only root file system).

- No passwd entry and no USER/LOGNAME: getpass.getuser() raises KeyError('getpwuid(): uid not found'), and torch's
  inductor cache, triton and others call it. USER and LOGNAME become `uid<N>`, which getpass reads first.
- A home it cannot write: every cache that defaults below it (Hugging Face hub and datasets, torch hub and
  extensions, pip) goes to $XDG_CACHE_HOME, configs to $XDG_CONFIG_HOME, triton to $TRITON_HOME, all under
  <temp dir>/home-<uid>; `docker run --read-only --tmpfs /tmp:exec` then just works.

Anything the user set wins, nothing changes for a user with a passwd entry and a writable home, and nothing here may
stop Python from starting: every failure leaves the environment as it was. Kept stdlib-only and fast (microseconds
when there is nothing to do). docs/image-environment.md.
"""

import os


def _settle(env=os.environ):
    uid = os.getuid()
    if not any(env.get(name) for name in ("LOGNAME", "USER", "LNAME", "USERNAME")):
        import pwd

        try:
            pwd.getpwuid(uid)
        except KeyError:
            env["USER"] = env["LOGNAME"] = f"uid{uid}"
    home = env.get("HOME") or os.path.expanduser("~")
    if home and os.access(home, os.W_OK):
        return
    import tempfile

    root = os.path.join(tempfile.gettempdir(), f"home-{uid}")
    os.makedirs(root, mode=0o700, exist_ok=True)
    env.setdefault("XDG_CACHE_HOME", os.path.join(root, ".cache"))
    env.setdefault("XDG_CONFIG_HOME", os.path.join(root, ".config"))
    env.setdefault("TRITON_HOME", root)


try:
    _settle()
except Exception:  # noqa: BLE001, S110 - no writable temp dir either: Python still starts, as without this hook
    pass
