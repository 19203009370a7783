"""The one compiled part of dpcli: the exact noise sampler (dpcli/core/_noise.c).

Everything else is in pyproject.toml. The extension is optional: where no C compiler is found,
pip installs dpcli without it and dpcli.core.noise_stream uses its numpy reference, which
draws the same numbers more slowly (`dpcli.core.noise_stream.BACKEND` says which is in use;
`make test` fails when the extension was not built, unless DPCLI_NOISE_BACKEND=reference).
"""

import sys

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "dpcli.core._noise",
            sources=["dpcli/core/_noise.c"],
            extra_compile_args=["-O3", "-std=gnu11", *([] if sys.platform == "win32" else ["-pthread"])],
            extra_link_args=[] if sys.platform == "win32" else ["-pthread"],
            optional=True,
        )
    ]
)
