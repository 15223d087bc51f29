"""The README's run-directory tables are the catalog's: users script against them, so a field or
event added to the catalog and not to the README (or the other way round) fails here."""

from __future__ import annotations

from pathlib import Path

from ckpt_tool.core import run_catalog

README = Path(__file__).resolve().parents[2] / "README.md"
START = "<!-- run-dir tables: generated from ckpt_tool.core.run_catalog -->"
END = "<!-- end of run-dir tables -->"


def _section() -> str:
    text = README.read_text(encoding="utf-8")
    assert START in text and END in text, f"README.md lost its run-directory tables (markers {START!r} ... {END!r})"
    return text[text.index(START) : text.index(END)]


def test_the_readme_holds_the_catalogs_tables_as_generated() -> None:
    section = _section()
    for name, table in (
        ("files", run_catalog.files_table()),
        ("run events", run_catalog.events_table()),
        ("checkpoint events", run_catalog.events_table(run_catalog.CHECKPOINT_EVENTS)),
    ):
        assert table in section, (
            f"README.md's {name} table differs from ckpt_tool.core.run_catalog: paste the output of "
            f"run_catalog.{'files_table()' if name == 'files' else 'events_table(...)'} between the markers"
        )


def test_every_event_and_file_of_the_catalog_is_named_in_the_readme() -> None:
    section = _section()
    names = [spec.name for spec in run_catalog.RUN_EVENTS + run_catalog.CHECKPOINT_EVENTS]
    names += [f.name for f in run_catalog.FILES]
    missing = [n for n in names if f"`{n}`" not in section]
    assert not missing, f"not in README.md's run-directory tables: {missing}"
