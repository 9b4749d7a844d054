"""`tts-appliance` command line: the group, `say`, and the commands of the cli_* modules.

Every command runs with the settings of `appliance.config.resolve`: the group's `--config PATH`
($TTS_APPLIANCE_CONFIG), its drop-ins and environment, then the command's own flags. A command that
fails prints one line on stderr (`error: ...`, exit status 2 for bad input, 1 for the queue); given
`--json`, it prints `{"error": {"message", "type", "exit_code"}}` on stdout instead.
"""
from __future__ import annotations

import json
import logging
import sys
from contextlib import contextmanager

import click

from engines.model.errors import TTSError
from jobs.queue import QueueError
from jobs.queue.location import redact

from appliance.cli_common import (config_path, emit, home_option, json_option, load_runner, model_options,
                                  run_settings, settings)

log = logging.getLogger("tts_appliance")


def setup_logging(verbose: int) -> None:
    from appliance.logs import Masked

    level = logging.WARNING - 10 * verbose
    handler = logging.StreamHandler()  # stderr, as basicConfig's
    handler.setFormatter(Masked())
    logging.basicConfig(level=max(level, logging.DEBUG), handlers=[handler])


class CommandError(click.ClickException):
    """A command's failure as the CLI reports it: `error: MESSAGE` on stderr, or JSON on stdout (--json)."""

    def __init__(self, message: str, kind: str, exit_code: int, as_json: bool):
        super().__init__(message)
        self.kind, self.exit_code, self.as_json = kind, exit_code, as_json

    def show(self, file=None) -> None:
        message = redact(self.message)  # a queue URL quoted by a message of some library shows no password
        if self.as_json:
            click.echo(json.dumps({"error": {"message": message, "type": self.kind, "exit_code": self.exit_code}}))
        else:
            click.echo(f"error: {message}", err=True)


def _wants_json(args) -> bool:
    """Whether a command's arguments ask for --json (options end at "--")."""
    args = list(args)
    return "--json" in (args[:args.index("--")] if "--" in args else args)


class Cli(click.Group):
    """The group: every failure of a command (its usage, bad input, the queue, files) becomes a CommandError."""

    def parse_args(self, ctx, args):
        ctx.meta["json_errors"] = _wants_json(args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        as_json = ctx.meta.get("json_errors", False)
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, CommandError):
            raise
        except click.ClickException as exc:
            if not as_json:
                raise
            raise CommandError(exc.format_message(), type(exc).__name__, exc.exit_code, True) from exc
        except QueueError as exc:  # e.g. jobs.queue names a database that cannot be reached or is newer
            raise CommandError(str(exc), type(exc).__name__, 1, as_json) from exc
        except (TTSError, OSError) as exc:
            raise CommandError(str(exc), type(exc).__name__, 2, as_json) from exc


@click.group(cls=Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="Config file for every command (default $TTS_APPLIANCE_CONFIG, else the user's "
                   "~/.config/tts-appliance/config.yaml if present, else /etc/tts-appliance/config.yaml).")
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def cli(config_path, verbose: int) -> None:
    """On-prem text-to-speech appliance around Qwen3-TTS."""
    setup_logging(verbose)


@contextmanager
def engine_errors():
    """Any other error of the engine (a bug, a checkpoint of shapes it cannot run) as a TTSError: one line
    and exit status 2 like bad input, not a traceback; the traceback is logged at debug level (-vv)."""
    try:
        yield
    except (TTSError, click.ClickException, OSError):
        raise
    except Exception as exc:  # noqa: BLE001 - reported in one line, the traceback at -vv
        log.debug("engine error", exc_info=True)
        first = str(exc).strip().splitlines()[:1]
        why = f"{type(exc).__name__}: {first[0]}" if first else type(exc).__name__
        raise TTSError(f"internal engine error ({why}); run again with -vv for the traceback and report it") from exc


def say_request(text: str, voice, language, instruct, ref_audio, ref_text, seed, greedy, max_frames):
    """The SynthesisRequest of `say` (max_frames: the official max_new_tokens - 1)."""
    from engines.api import SamplingParams, SynthesisRequest

    kw = dict(seed=seed, max_new_tokens=max_frames + 1 if max_frames else None)
    sampling = SamplingParams.greedy(**kw) if greedy else SamplingParams(**kw)
    return SynthesisRequest(text=text, voice=voice, language=language, instruct=instruct, ref_audio=ref_audio,
                            ref_text=ref_text, sampling=sampling)


@click.command()
@click.argument("text")
@model_options
@click.option("--voice", help="CustomVoice speaker (e.g. vivian) or a saved cloned voice (Base).")
@click.option("--language", default="auto", show_default=True, help="Language name or auto.")
@click.option("--instruct", help="Voice description (VoiceDesign) or style instruction (1.7B CustomVoice).")
@click.option("--ref-audio", type=click.Path(), help="Reference audio to clone (Base checkpoints).")
@click.option("--ref-text", help="Transcript of the reference audio (enables in-context cloning).")
@click.option("--save-voice", type=click.Path(dir_okay=False),
              help="Also save the cloned voice to this file, reusable with --voice FILE.")
@click.option("-o", "--output", default="out.wav", show_default=True, type=click.Path(dir_okay=False))
@click.option("--seed", type=int, help="Sampling seed (same seed, same audio).")
@click.option("--greedy", is_flag=True, help="Greedy decoding instead of sampling.")
@click.option("--max-frames", type=int, help="Upper bound on generated frames (12.5 per second).")
def say(text, model, device, dtype, voice, language, instruct, ref_audio, ref_text, save_voice, output, seed, greedy,
        max_frames):
    """Speak TEXT into a 24 kHz WAV file."""
    from engines.model.audio import write_wav

    with engine_errors():
        runner = load_runner(settings(model=model, device=device, dtype=dtype), slots=1, usage_error=True)
        if ref_audio and save_voice:  # clone once: save the voice, then speak with the saved file
            runner.engine.make_voice(ref_audio, ref_text).save(save_voice)
            log.info("saved voice to %s", save_voice)
            voice, ref_audio, ref_text = save_voice, None, None
        req = say_request(text, voice, language, instruct, ref_audio, ref_text, seed, greedy, max_frames)
        [res] = runner.synthesize([req])
    write_wav(output, res.audio, res.sample_rate)
    click.echo(f"wrote {output}: {len(res.audio) / res.sample_rate:.2f} s at {res.sample_rate} Hz"
               f"{'' if res.finished_by_eos else ' (stopped at the frame limit)'}")


@click.command()
@model_options
@home_option
@json_option
@click.option("--no-daemon", is_flag=True, help="Do not ask a running daemon for its /health.")
def info(model, device, dtype, home, as_json, no_daemon):
    """Describe this installation for a bug report: devices, the settings as decided (what the daemon and
    the job commands run with), model, engines and why, codec engines, sockets, queue, config files read,
    and the running daemon's /health. No weights are loaded."""
    from appliance.info import collect, render

    report = collect(run_settings(model=model, device=device, dtype=dtype, home=home), config_path(),
                     daemon=not no_daemon)
    emit(as_json, report, render(report))


def _add_commands() -> None:
    from appliance.cli_build import build_engines_cmd
    from appliance.cli_daemon import daemon
    from appliance.cli_jobs import COMMANDS
    from appliance.cli_preview import preview
    from appliance.cli_spool import COMMANDS as SPOOL_COMMANDS
    from appliance.cli_work import watch, work

    for command in (say, info, daemon, build_engines_cmd, *COMMANDS, *SPOOL_COMMANDS, preview, work, watch):
        cli.add_command(command)


_add_commands()


def main() -> None:
    try:
        cli(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
