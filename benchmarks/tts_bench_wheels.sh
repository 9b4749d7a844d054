#!/usr/bin/env bash
# Wheels to carry tts-bench (nari-labs/benchmarks, folder tts_bench; not part of this repository) to the GPU
# machine, which has no internet: tts-bench's own wheel, built here from a checkout of it, and the packages it
# needs that the GPU image lacks (it has aiohttp, click, numpy and regex), for Python 3.12 x86-64, into ./.whl.
# Usage, from the project root (with .whl/ in .git/info/exclude):
#   bash benchmarks/tts_bench_wheels.sh PATH/TO/benchmarks/tts_bench
# Then, in a GPU run, carry ".whl" (benchmarks/device_run.sh installs .whl/*.whl into /tmp/site) and run
#   python3 -m benchmarks.tts_bench --dummy 1.7b --device cuda --bench "python3 -m tts_bench" ...
# (docs/PERFORMANCE.md, "tts-bench against the daemon"). The pins are what pip resolved for tts-bench 0.1.0
# here; one version of each package, or the install on the GPU machine stops.
set -euo pipefail
src=${1:?give the folder of tts-bench (nari-labs/benchmarks, tts_bench), holding its pyproject.toml}
[ -f "$src/pyproject.toml" ] || { echo "no pyproject.toml in $src: give the tts_bench folder" >&2; exit 2; }
dest=.whl
mkdir -p "$dest"
python3 -m pip wheel -q --no-deps --ignore-requires-python -w "$dest" "$src"  # pure Python: builds anywhere
plat=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
python3 -m pip download -q --no-deps "${plat[@]}" -d "$dest" \
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
  jiwer==4.0.0 rapidfuzz==3.14.6 whisper-normalizer==0.1.15 more-itertools==11.2.1 indic-numtowords==1.1.0 \
  text2num==3.1.0
du -sh "$dest"
