"""Check results: one shape for every check, written as DIR/<check>.json and printed briefly.

JSON of one check:
  {"name", "passed", "mode", "seconds", "summary", "diagnosis": [str], "figures": {..},
   "items": [{"name", "ok", "detail"}]}
"items" are the individual assertions (ok: true/false/null, null = skipped, not a failure);
"diagnosis" lists recognised failure signatures (smoke.signatures) and fix hints.
"""

import json
import os
import sys
import time

from smoke import signatures

OK, BAD, SKIP = "\u2713", "\u2715", "-"


def default_out_dir():
    return os.environ.get("SMOKE_OUT") or "/tmp/smoke"


class Result:
    def __init__(self, name, mode):
        self.name = name
        self.mode = mode
        self.items = []
        self.figures = {}
        self.diagnosis = []
        self.summary = ""
        self._t0 = time.monotonic()
        self.seconds = None

    def add(self, name, ok, detail=""):
        """Record one assertion; ok=None means skipped (does not fail the check)."""
        self.items.append({"name": name, "ok": ok, "detail": str(detail)})
        return ok

    def diagnose(self, text):
        """Add signature explanations found in text (dedup; keeps the report short)."""
        for line in signatures.explain(text):
            if line not in self.diagnosis:
                self.diagnosis.append(line)

    def hint(self, text):
        if text not in self.diagnosis:
            self.diagnosis.append(text)

    @property
    def passed(self):
        return bool(self.items) and all(i["ok"] is not False for i in self.items)

    def finish(self, summary=None):
        self.seconds = round(time.monotonic() - self._t0, 2)
        if summary is not None:
            self.summary = summary
        bad = [i["name"] for i in self.items if i["ok"] is False]
        if not self.items:
            self.summary = "no assertions ran" + ("; " + self.summary if self.summary else "")
        elif bad:
            head = f"{len(bad)} failed: " + ", ".join(bad[:4]) + (" ..." if len(bad) > 4 else "")
            self.summary = head + ("; " + self.summary if self.summary else "")
            # The failed assertions lead the diagnosis: a person reads what broke first, then why.
            failed = [f"{i['name']}: {i['detail']}" for i in self.items if i["ok"] is False]
            self.diagnosis = failed + [d for d in self.diagnosis if d not in failed]
        elif not self.summary:
            self.summary = f"all {len(self.items)} assertions passed"
        faults = self.figures.get("teardown_faults") if isinstance(self.figures, dict) else None
        if faults and "teardown fault" not in self.summary:
            # Said where every reader looks (the check's line, the verdict table): the clean exit is not proven.
            self.summary += "; teardown fault, exit not proven: " + "; ".join(faults[:2])
        return self

    def to_dict(self):
        return {"name": self.name, "passed": self.passed, "mode": self.mode,
                "seconds": self.seconds, "summary": self.summary,
                "diagnosis": self.diagnosis, "figures": self.figures, "items": self.items}


def write_json(out_dir, name, data):
    os.makedirs(out_dir, exist_ok=True)
    return write_json_file(os.path.join(out_dir, name + ".json"), data)


def write_json_file(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=False, default=str)
        f.write("\n")
    os.replace(tmp, path)  # atomic: a reader never sees half a file
    return path


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _fmt_fig(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def print_result(d, key_figures=(), stream=None):
    """A few lines: header, failed assertions, diagnosis, a handful of key figures."""
    stream = stream or sys.stdout
    mark = OK if d.get("passed") else BAD
    secs = d.get("seconds")
    stream.write("{} {} [{}] {}{}\n".format(mark, d.get("name"), d.get("mode"),
                                        d.get("summary", ""),
                                        (f" ({secs:.1f}s)") if isinstance(secs, (int, float)) else ""))
    failed = [f"{it['name']}: {it.get('detail', '')}" for it in d.get("items", []) if it.get("ok") is False]
    for line in failed:
        stream.write(f"    {BAD} {line}\n")
    for line in [x for x in d.get("diagnosis", []) if x not in failed][:6]:
        stream.write(f"    ! {line}\n")
    figs = d.get("figures", {})
    shown = [f"{k}={_fmt_fig(figs[k])}" for k in key_figures if figs.get(k) is not None]
    if shown:
        stream.write("    " + "  ".join(shown) + "\n")
    stream.flush()
