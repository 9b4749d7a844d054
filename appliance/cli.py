"""`tts-appliance` command line."""
from __future__ import annotations

import logging
import os
import sys

import click

from engines.model.errors import TTSError

log = logging.getLogger("tts_appliance")

DEFAULT_MODEL_ENV = "TTS_APPLIANCE_MODEL"


def setup_logging(verbose: int) -> None:
    level = logging.WARNING - 10 * verbose
    logging.basicConfig(level=max(level, logging.DEBUG), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def default_model() -> str | None:
    return os.environ.get(DEFAULT_MODEL_ENV)


def pick_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """On-prem text-to-speech appliance around Qwen3-TTS."""
    setup_logging(verbose)


def model_option(f):
    return click.option("--model", "model", default=default_model, show_default=f"${DEFAULT_MODEL_ENV}",
                        help="Folder of a Qwen3-TTS checkpoint (official layout).")(f)


@cli.command()
@click.argument("text")
@model_option
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
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto.")
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "bfloat16", "float16"]))
def say(text, model, voice, language, instruct, ref_audio, ref_text, save_voice, output, seed, greedy,
        max_frames, device, dtype):
    """Speak TEXT into a 24 kHz WAV file."""
    from engines.api import SamplingParams, SynthesisRequest, TTSEngine
    from engines.model.audio import write_wav

    if not model:
        raise click.UsageError(f"no model: pass --model PATH or set ${DEFAULT_MODEL_ENV}")
    engine = TTSEngine.load(model, device=pick_device(device), dtype=dtype)
    kw = dict(seed=seed, max_new_tokens=max_frames + 1 if max_frames else None)
    sampling = SamplingParams.greedy(**kw) if greedy else SamplingParams(**kw)
    if ref_audio and save_voice:
        engine.make_voice(ref_audio, ref_text).save(save_voice)
        log.info("saved voice to %s", save_voice)
    req = SynthesisRequest(text=text, voice=voice, language=language, instruct=instruct, ref_audio=ref_audio,
                           ref_text=ref_text, sampling=sampling)
    [res] = engine.synthesize([req])
    write_wav(output, res.audio, res.sample_rate)
    click.echo(f"wrote {output}: {len(res.audio) / res.sample_rate:.2f} s at {res.sample_rate} Hz"
               f"{'' if res.finished_by_eos else ' (stopped at the frame limit)'}")


def _register_extras() -> None:
    __import__("appliance.cli_daemon", fromlist=["register"]).register(cli)  # `daemon` command
    __import__("appliance.cli_build", fromlist=["register"]).register(cli)  # `build-engines` command
    try:
        from appliance.cli_jobs import register
    except ImportError as exc:  # the jobs commands need their optional parts installed
        if exc.name and exc.name.startswith("appliance"):
            return
        raise
    register(cli)


_register_extras()


def main() -> None:
    try:
        cli(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except TTSError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except OSError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
