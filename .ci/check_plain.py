"""After the README's first command: the venv is a plain install and the sample it wrote plays.

Plain: none of the test extras or speed-ups is installed (else CI would not see what a user gets).
Playable: a RIFF/WAVE file of 16-bit mono 24 kHz with audio in it, which ffmpeg decodes end to end when
ffmpeg is on this machine. Exit status 1 with the reason otherwise.
"""
import importlib.util
import shutil
import subprocess
import sys
import wave

EXTRAS = ("pytest", "triton", "onnxruntime", "onnx", "openai", "websockets", "scipy")


def main(path: str) -> int:
    present = [n for n in EXTRAS if importlib.util.find_spec(n) is not None]
    if present:
        print(f"ci: not a plain install: {', '.join(present)} installed (the first command must run without "
              "the test extras)")
        return 1
    try:
        with wave.open(path) as w:
            rate, channels, width, frames = w.getframerate(), w.getnchannels(), w.getsampwidth(), w.getnframes()
    except (OSError, EOFError, wave.Error) as exc:
        print(f"ci: {path} is not a playable WAV: {exc}")
        return 1
    if (rate, channels, width) != (24000, 1, 2) or frames < rate // 10:
        print(f"ci: {path}: {rate} Hz, {channels} channel(s), {8 * width}-bit, {frames} frames: not the speech expected")
        return 1
    if shutil.which("ffmpeg"):
        r = subprocess.run(["ffmpeg", "-v", "error", "-i", path, "-f", "null", "-"], capture_output=True, text=True)
        if r.returncode or r.stderr.strip():
            print(f"ci: ffmpeg cannot decode {path}: {r.stderr.strip()[-500:]}")
            return 1
    print(f"ci: {path}: {frames / rate:.2f} s of 24 kHz audio from a plain install")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
