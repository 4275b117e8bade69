#!/usr/bin/env bash
# CuTe DSL on the H200, which reaches no package registry: the wheels staged here by
# ../shared/gpu/stage-cute-wheels.sh travel in two device calls that follow each other within ~30 s
# (a transfer is limited to 64 MiB): `bash scripts/h200_cute.sh a` in the call sent with .device-stage/a,
# then `source scripts/h200_cute.sh b` in the next one, sent with .device-stage/b: it installs into /tmp/site
# and exports PYTHONPATH (CuTe DSL first, then the repository).
set -u
case ${1:-} in
  a) mkdir -p /tmp/stage && cp .device-stage/a/* /tmp/stage/ && ls /tmp/stage ;;
  b) if [ -d /tmp/stage ]; then
       cp .device-stage/b/* /tmp/stage/ && (cd /tmp/stage && cat cu13.part.* > "$(cat WHEEL_NAME)" && rm cu13.part.* \
         && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/stage/*.whl) \
         && echo "CuTe DSL installed in /tmp/site"
     else
       echo "CuTe DSL NOT installed: /tmp/stage is missing (the machine was restarted between the two calls)"
     fi
     export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD ;;
  *) echo "usage: bash scripts/h200_cute.sh a | source scripts/h200_cute.sh b"; exit 2 ;;
esac
