"""`tts-appliance preview FILE`: a document's chapters and estimates, before anything is queued."""
from __future__ import annotations

from pathlib import Path

import click

from jobs.settings import JobSpec

from appliance.cli_common import emit, fail, home_option, json_option, settings


def preview_file(path: str, spec: JobSpec, configured_rate, db_path, max_bytes: int, voices=None) -> dict:
    """Ingest and segment one file as `submit` would (up to `max_bytes`: jobs.max_file_mb) and plan it
    (`jobs.plan.plan_document`: chapters, totals, voices of [voice=...] tags not among `voices`)."""
    from jobs.errors import JobError
    from jobs.ingest import IngestOptions, load_document
    from jobs.plan import plan_document
    from jobs.submit import SubmitError, precheck_file

    try:
        precheck_file(Path(path))
        doc = load_document(Path(path), IngestOptions(max_bytes=max_bytes))
        plan = plan_document(doc, spec, Path(path).stem, configured_rate, db_path, voices)
    except (SubmitError, JobError, ValueError) as exc:
        fail(str(exc))
    return {"file": path, **plan}


def _minutes(seconds) -> str:
    if seconds is None:
        return "?"
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def describe_preview(p: dict) -> str:
    lines = [f"{p['file']}: {p['title']} (language {p['language']})",
             f"  {'#':>3}  {'segments':>8}  {'chars':>7}  {'audio':>8}  title"]
    for c in p["chapters"]:
        mark = " " if c["selected"] else "-"
        lines.append(f" {mark}{c['number']:>3}  {c['segments']:>8}  {c['characters']:>7}  {_minutes(c['audio_s']):>8}"
                     f"  {c['title']}")
    t = p["total"]
    if t["chapters"] < len(p["chapters"]):
        lines.append("  (-: not in --chapters)")
    for name, numbers in p["unknown_voices"].items():
        lines.append(f"  unknown voice {name!r} in [voice=...] tags (chapter {', '.join(map(str, numbers))}): "
                     f"submit refuses it; available: {', '.join(p['voices'])}")
    lines.append(f"  {t['chapters']} chapters, {t['segments']} segments, {t['characters']} characters, "
                 f"about {_minutes(t['audio_s'])} of audio")
    if t["rate_source"] == "configured":
        how = f"at {t['rate']} audio s/s (configured: jobs.synth_rate)"
    elif t["rate_source"] == "measured":
        how = f"at {t['rate']} audio s/s (measured on this machine over {t['measured_audio_s']} s of audio)"
    else:
        lines.append("  synthesis time: unknown (no jobs synthesized here yet; set jobs.synth_rate to estimate)")
        return "\n".join(lines)
    lines.append(f"  synthesis time: about {_minutes(t['synthesis_s'])} {how}")
    return "\n".join(lines)


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path())
@click.option("--language", default="auto", show_default=True, help="Language name (e.g. english) or auto.")
@click.option("--chapters", help="Mark the chapters a `submit --chapters` would keep (e.g. 1,3-5).")
@click.option("--speed", type=float, default=1.0, show_default=True, help="Speaking speed (0.25-4.0) of the estimate.")
@home_option
@json_option
def preview(files, language, chapters, speed, home, as_json):
    """Show FILES' chapters (numbers for --chapters), segments, characters, estimated audio length and
    synthesis time on this machine, and voices of [voice=...] tags the configured model lacks, without
    queueing anything.

    Audio length assumes 15 characters a second (5 for Chinese, Japanese, Korean: the speaking rates of
    engines.model.text) plus the pauses between segments; the synthesis time uses jobs.synth_rate of the config, else the rate measured
    from the segments this spool folder has synthesized."""
    from appliance.settings import catalog, checkpoint, voices_dir

    cfg = settings(home=home)
    try:
        spec = JobSpec(language=language, chapters=chapters, speed=speed)
    except ValueError as exc:
        fail(str(exc))
    db = cfg.home().db
    cat = catalog(checkpoint(cfg), voices_dir(cfg))  # the configured checkpoint's, if any
    voices = cat.voices if cat is not None else None
    out = [preview_file(f, spec, cfg.jobs.synth_rate, db, cfg.jobs.max_file_mb << 20, voices) for f in files]
    emit(as_json, out if len(out) > 1 else out[0], "\n\n".join(describe_preview(p) for p in out))
