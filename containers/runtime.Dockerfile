# A CUDA runtime image: a base image with python3, plus one runtime wheel unpacked.
#
# Built with no network (the harness builds it with network_mode "none"): the wheel is
# downloaded on the host into the build context, and unpacked with the base's own python3
# (`python3 -m zipfile`), so neither pip nor an index is needed here.
#
# Build arguments (the harness passes all of them; the tag is a hash of this file, the
# wheel's sha256 and the base image id, so unchanged inputs never rebuild):
#   BASE_IMAGE           any image with python3 >= 3.7 (cumatrix CI: containers/build-base.sh)
#   WHEEL                file name of the wheel in the build context
#   CUDART_RELPATH       path of libcudart.so.* inside the wheel, e.g. nvidia/cu13/lib/libcudart.so.13
#   RUNTIME_NAME, RUNTIME_VERSION, RUNTIME_REQUIREMENT   recorded as labels
ARG BASE_IMAGE=python:3.12-slim

FROM ${BASE_IMAGE} AS unpack
ARG WHEEL=runtime.whl
COPY ${WHEEL} /tmp/runtime.whl
RUN python3 -m zipfile -e /tmp/runtime.whl /opt/cumatrix/runtime

FROM ${BASE_IMAGE}
ARG CUDART_RELPATH
ARG RUNTIME_NAME=""
ARG RUNTIME_VERSION=""
ARG RUNTIME_REQUIREMENT=""
COPY --from=unpack /opt/cumatrix/runtime /opt/cumatrix/runtime
# The child (python3 -m cumatrix.case) loads the runtime from here when its spec names none.
ENV CUMATRIX_CUDART=/opt/cumatrix/runtime/${CUDART_RELPATH}
# Fail the build, not the first cell, when the library is missing or cannot be loaded
# (libcudart loads without a driver; it needs libcuda only on its first real call).
RUN python3 -c "import ctypes, os; ctypes.CDLL(os.environ['CUMATRIX_CUDART'])"
LABEL cumatrix.runtime.name="${RUNTIME_NAME}" \
      cumatrix.runtime.version="${RUNTIME_VERSION}" \
      cumatrix.runtime.requirement="${RUNTIME_REQUIREMENT}"
CMD ["python3"]
