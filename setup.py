"""The one compiled part of the package; everything else is declared in pyproject.toml.

gateway.policies.board_cards._jsonscan is the C scanner behind board_cards' speed on large boards. It is optional:
where no C compiler is found, the install goes on without it and json_splice reads every array in Python (the same
answers, more slowly). tests/test_jsonscan.py fails when it is missing, so CI always has it.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "gateway.policies.board_cards._jsonscan", sources=["gateway/policies/board_cards/_jsonscan.c"],
            optional=True,
        )
    ]
)
