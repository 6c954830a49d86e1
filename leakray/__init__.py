"""leakray: does a code LLM know the benchmark it is evaluated on?"""

__version__ = "0.1.0"
