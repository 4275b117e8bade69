#!/usr/bin/env bash
# CuTe DSL on the H200, which reaches no package registry: the wheels staged here by
# ../shared/gpu/stage-cute-wheels.sh travel in two device calls that follow each other within ~30 s
# (a transfer is limited to 64 MiB): `bash scripts/h200_cute.sh a` in the call sent with .device-stage/a,
# then `source scripts/h200_cute.sh b` in the next one, sent with .device-stage/b: it installs into /tmp/site
# and exports PYTHONPATH (CuTe DSL first, then the repository).
# When the working tree plus part a exceed the 64 MiB transfer (the tracked tree is ~17 MB), split the staged
# wheels into three parts here with `bash scripts/h200_cute.sh split` and send them in three calls, each sent
# with its part: `bash scripts/h200_cute.sh p1` (.device-stage/p1), `bash scripts/h200_cute.sh p2`
# (.device-stage/p2), then `source scripts/h200_cute.sh p3` (.device-stage/p3), which installs and exports.
set -u
install_staged() {
  (cd /tmp/stage && cat cu13.part.* > "$(cat WHEEL_NAME)" && rm cu13.part.* \
    && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/stage/*.whl) \
    && echo "CuTe DSL installed in /tmp/site"
}
case ${1:-} in
  split) rm -rf .device-stage/p1 .device-stage/p2 .device-stage/p3 && mkdir -p .device-stage/p1 .device-stage/p2 \
           .device-stage/p3 && cat .device-stage/a/cu13.part.* .device-stage/b/cu13.part.* > .device-stage/cu13.whl \
         && split -b 31M -d .device-stage/cu13.whl .device-stage/cu13.part. && rm .device-stage/cu13.whl \
         && mv .device-stage/cu13.part.00 .device-stage/p1/ && mv .device-stage/cu13.part.01 .device-stage/p2/ \
         && mv .device-stage/cu13.part.02 .device-stage/p3/ && cp .device-stage/a/*.whl .device-stage/p1/ \
         && cp .device-stage/b/WHEEL_NAME .device-stage/p3/ && du -sh .device-stage/p1 .device-stage/p2 .device-stage/p3 ;;
  a|p1|p2) mkdir -p /tmp/stage && cp ".device-stage/$1/"* /tmp/stage/ && ls /tmp/stage ;;
  b|p3) if [ -d /tmp/stage ]; then
          cp ".device-stage/$1/"* /tmp/stage/ && install_staged
        else
          echo "CuTe DSL NOT installed: /tmp/stage is missing (the machine was restarted between the calls)"
        fi
        export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD ;;
  *) echo "usage: bash scripts/h200_cute.sh a | source scripts/h200_cute.sh b;" \
       "bash scripts/h200_cute.sh split (here) | p1 | p2 | source scripts/h200_cute.sh p3"; exit 2 ;;
esac
