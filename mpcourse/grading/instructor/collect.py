"""`mpcourse collect`: an LMS's bulk download laid out as `submissions/<learner>/<exercise>.ipynb`.

Each system names the files of its "download all submissions" zip in its own way:

- Canvas (canvas-lms `lib/content_zipper.rb`, read at commit 05e9653c, 2025): one flat zip of
  `<sortable name>[_LATE]_<user id>_<attachment id>_<file name as uploaded>`. The name is
  lower-cased with every non-word character removed ("Lovelace, Ada" -> "lovelaceada"); `LATE`
  marks a submission after the due date; with anonymous grading the user id is `anon_<id>`. A
  file uploaded again under the same name is renamed by Canvas (`ex00_bytes-1.ipynb`), and the
  attachment ids grow with each upload. The learner's folder is the Canvas user id, the ID
  column of Canvas's gradebook import.
- Moodle (`mod/assign`, "Download all submissions"; Moodle 4.x `classes/local/downloader.php`):
  with "Download submissions in folders" (the default since Moodle 3.1),
  `<Full Name>_<participant id>_assignsubmission_file[_]/<file name>`; without it, flat files
  `<Full Name>_<participant id>_assignsubmission_file_<file name>`. The participant id differs
  from one assignment to the next, so the learner is the full name, or the login a roster CSV
  (columns `name`, `login`) gives for it: Moodle's gradebook import matches usernames.

Within one learner and exercise the newest upload is kept (the zip entry's timestamp, which is the
LMS's upload time, then Canvas's attachment id), and every other copy is reported. Files that
name no exercise, or are not notebooks, are reported and left out. `learners.csv` beside the
folders records each learner's name and LMS id for the gradebook imports.
"""
from __future__ import annotations

import csv
import io
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from mpcourse.grading.atomic import write_atomically
from mpcourse.grading.judging.exercise import exercise_id
from mpcourse.grading.platforms.lms import LEARNERS_FILE

SYSTEMS = ("canvas", "moodle")
MAX_FILE_BYTES = 50 << 20  # the grader refuses larger notebooks anyway
CANVAS_NAME = re.compile(r"^(?:(?P<name>.*?)_)??(?P<late>LATE_)?(?P<user>\d+|anon_[A-Za-z0-9]+)_"
                         r"(?P<attachment>\d+)_(?P<file>.+)$")
MOODLE_FOLDER = re.compile(r"^(?P<name>.+)_(?P<user>\d+)_assignsubmission_file_?$")
MOODLE_FLAT = re.compile(r"^(?P<name>.+)_(?P<user>\d+)_assignsubmission_file_(?P<file>.+)$")
UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class Upload:
    """One file of the download, as the LMS named it."""
    member: str          # its path in the download
    data: bytes
    when: tuple          # the zip entry's date_time (the upload's time), or () in a folder
    learner: str = ""
    name: str = ""       # the learner's name as the LMS wrote it
    lms_id: str = ""
    file: str = ""       # the file name the learner uploaded
    late: bool = False
    order: int = 0       # Canvas's attachment id: larger is newer


@dataclass
class Collected:
    """What `collect` placed, and everything the instructor should know about the rest."""
    placed: dict[tuple[str, str], Upload] = field(default_factory=dict)  # (learner, exercise) -> upload
    messages: list[str] = field(default_factory=list)


def read_download(download: str | Path) -> list[Upload]:
    """Every regular file of a zip or an unpacked folder, with its timestamp where the zip has one."""
    download = Path(download)
    uploads = []
    if download.is_dir():
        for path in sorted(p for p in download.rglob("*") if p.is_file() and not p.is_symlink()):
            size = path.stat().st_size
            data = path.read_bytes() if size <= MAX_FILE_BYTES else b""
            uploads.append(Upload(path.relative_to(download).as_posix(), data, ()))
        return uploads
    if not zipfile.is_zipfile(download):
        raise ValueError(f"{str(download)!r} is neither a folder nor a zip file: pass the LMS's download")
    with zipfile.ZipFile(download) as zf:
        for info in zf.infolist():
            if info.is_dir():
                continue
            data = zf.read(info) if info.file_size <= MAX_FILE_BYTES else b""
            uploads.append(Upload(info.filename, data, info.date_time))
    return uploads


def _safe(text: str) -> str:
    return UNSAFE.sub("_", text).strip("._") or "unnamed"


def parse(system: str, upload: Upload, roster: dict[str, str]) -> Upload | None:
    """The upload with its learner and file name read from the LMS's naming, or None if it has none."""
    parts = upload.member.split("/")
    if system == "canvas":
        found = CANVAS_NAME.match(parts[-1])
        if not found:
            return None
        return Upload(upload.member, upload.data, upload.when, _safe(found["user"]), found["name"] or "",
                      found["user"], found["file"], bool(found["late"]), int(found["attachment"]))
    folder = next((MOODLE_FOLDER.match(part) for part in parts[:-1] if MOODLE_FOLDER.match(part)), None)
    found = folder or MOODLE_FLAT.match(parts[-1])
    if not found:
        return None
    name = found["name"]
    learner = roster.get(name) or roster.get(name.casefold()) or name
    return Upload(upload.member, upload.data, upload.when, _safe(learner), name, roster.get(name, ""),
                  parts[-1] if folder else found["file"])


def read_roster(path: str | Path | None) -> dict[str, str]:
    """name -> login from a CSV with columns `name` and `login` (Moodle names no login)."""
    if path is None:
        return {}
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if not {"name", "login"} <= set(reader.fieldnames or ()):
            raise ValueError(f"the roster {str(path)!r} needs the columns name and login, has "
                             f"{reader.fieldnames}")
        rows = list(reader)
    return {key: row["login"] for row in rows for key in (row["name"], row["name"].casefold())}


def collect(system: str, download: str | Path, out: str | Path, exercises: list[str],
            roster: str | Path | None = None) -> Collected:
    """Write `out/<learner>/<exercise>.ipynb` from `download`; `exercises` are the exercise names."""
    if system not in SYSTEMS:
        raise ValueError(f"--from must be one of {', '.join(SYSTEMS)}, got {system!r}")
    by_id = {exercise_id(name): name for name in exercises}
    names = read_roster(roster)
    report = Collected()
    candidates: dict[tuple[str, str], list[Upload]] = {}
    for raw in read_download(download):
        upload = parse(system, raw, names)
        if upload is None:
            report.messages.append(f"cannot place {raw.member!r}: not named as a {system} download "
                                   "names a file")
        elif not raw.data:
            report.messages.append(f"cannot place {raw.member!r}: empty, or over {MAX_FILE_BYTES >> 20} MiB")
        elif not upload.file.lower().endswith(".ipynb"):
            report.messages.append(f"{upload.learner}: cannot place {upload.file!r}: not a notebook (.ipynb)")
        elif exercise_id(upload.file) not in by_id:
            report.messages.append(f"{upload.learner}: cannot place {upload.file!r}: its name starts with no "
                                   f"exercise id ({', '.join(sorted(by_id))})")
        else:
            candidates.setdefault((upload.learner, by_id[exercise_id(upload.file)]), []).append(upload)
    for (learner, exercise), uploads in sorted(candidates.items()):
        newest = max(uploads, key=lambda u: (u.when, u.order))
        report.placed[learner, exercise] = newest
        if len(uploads) > 1:
            others = ", ".join(repr(u.file) for u in uploads if u is not newest)
            report.messages.append(f"{learner}: {len(uploads)} uploads of {exercise}: kept the newest, "
                                   f"{newest.file!r}{_when(newest)}; left out {others}")
        if newest.late:
            report.messages.append(f"{learner}: {exercise} was handed in late (the LMS marked it LATE)")
    out = Path(out)
    for (learner, exercise), upload in report.placed.items():
        write_atomically(out / learner / f"{exercise}.ipynb", upload.data)
    _write_learners(out, system, report.placed.values())
    return report


def _when(upload: Upload) -> str:
    if not upload.when:
        return ""
    year, month, day, hour, minute, second = upload.when
    return f" ({year:04d}-{month:02d}-{day:02d} {hour:02d}:{minute:02d}:{second:02d})"


def _write_learners(out: Path, system: str, uploads) -> None:
    """learners.csv: each learner's folder, name and LMS id, merged with an earlier collect's."""
    path = out / LEARNERS_FILE
    known = {}
    if path.is_file():
        with open(path, newline="", encoding="utf-8") as f:
            known = {row["learner"]: row for row in csv.DictReader(f)}
    for u in uploads:
        known[u.learner] = {"learner": u.learner, "name": u.name, "lms_id": u.lms_id, "system": system}
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, ["learner", "name", "lms_id", "system"])
    writer.writeheader()
    writer.writerows(known[k] for k in sorted(known))
    write_atomically(path, text.getvalue())
