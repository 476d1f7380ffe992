#!/usr/bin/env bash
# For a GPU machine without network that has PyTorch and transformers but not the rest of
# what loomrl's learner imports: run this where PyPI is reachable, from the project root,
# and carry .whl/ there beside the project (scripts/gpu_check.sh installs it).
# PYTHON_VERSION: the GPU machine's Python (default 3.12).
set -euo pipefail
[ -d loomrl ] || { echo "run this from the project root" >&2; exit 1; }
version=${PYTHON_VERSION:-3.12}
mkdir -p .whl
for spec in pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
    typing-inspection==0.4.5 typing-extensions==4.16.0 tomli-w==1.2.0; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$version" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "$spec"
done
ls .whl
