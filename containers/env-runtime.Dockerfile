# An environment runtime image: a base image with python3, plus a virtual environment that
# uv builds offline from the wheels in the build context (`{requirements: [...]}` runtimes).
#
# Built with no network (network_mode "none"): the harness puts the uv binary, the wheels
# (downloaded on the host for the base image's Python) and requirements.txt in the context.
# The tag is a hash of this file, the requirements, every wheel's sha256 and the base image id.
#
# Build arguments: BASE_IMAGE (any image with python3), RUNTIME_NAME (recorded as a label).
ARG BASE_IMAGE=python:3.12-slim

FROM ${BASE_IMAGE} AS build
COPY uv requirements.txt /tmp/build/
COPY wheels/ /tmp/build/wheels/
RUN /tmp/build/uv venv --no-config --quiet --python "$(command -v python3)" /opt/cumatrix/env \
 && /tmp/build/uv pip install --no-config --quiet --offline --no-index --find-links /tmp/build/wheels \
        --no-build --link-mode copy --python /opt/cumatrix/env/bin/python -r /tmp/build/requirements.txt \
 && lib="$(ls /opt/cumatrix/env/lib/python3*/site-packages/nvidia/*/lib/libcudart.so.* | head -n 1)" \
 && test -n "$lib" && mkdir -p /opt/cumatrix/cudart && ln -s "$lib" /opt/cumatrix/cudart/libcudart.so

FROM ${BASE_IMAGE}
ARG RUNTIME_NAME=""
COPY --from=build /opt/cumatrix /opt/cumatrix
# Cells run inside the environment: its python3 first on PATH, its libcudart the runtime.
ENV VIRTUAL_ENV=/opt/cumatrix/env \
    PATH=/opt/cumatrix/env/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    CUMATRIX_CUDART=/opt/cumatrix/cudart/libcudart.so
LABEL cumatrix.runtime.name="${RUNTIME_NAME}"
CMD ["python3"]
