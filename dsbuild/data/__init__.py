"""Training data of a job: records read through Hugging Face ``datasets``, checked, tokenized for a causal LM,
packed, batched.

The rooms:

- ``records``: each record checked against its format (``text``, ``alpaca``, ``messages``, ``sharegpt``) and put
  in one shape, every problem named by field; JSON / JSON Lines read with the stdlib (``read_records``);
- ``tokens``: records as ``input_ids`` and ``labels`` (``-100`` where no loss is taken), prompt templates and
  chat templates (``tokenize``, ``encode``);
- ``packing``: short samples packed into ``max_length`` sequences (``pack``);
- ``sources``: files, folders, ``save_to_disk`` folders and hub datasets as a ``datasets.Dataset``, and where
  a record is in them;
- ``pipeline``: a job's ``[data]`` made ready (``load``, ``check``: loaded, checked, tokenized with
  ``Dataset.map`` and its cache, split, cut, packed);
- ``batching``: padded tensors per batch (``collate``).

Importing the package is light: ``datasets``, ``numpy`` and ``torch`` are imported by the functions that use them.
"""

from ..job.formats import FORMATS, IGNORE_INDEX, TEMPLATES
from .batching import collate
from .packing import pack
from .pipeline import Datasets, Samples, check, load
from .records import check_record, prompt_of, read_records
from .tokens import Tokenized, tokenize

__all__ = [
    "FORMATS",
    "IGNORE_INDEX",
    "TEMPLATES",
    "Datasets",
    "Samples",
    "Tokenized",
    "check",
    "check_record",
    "collate",
    "load",
    "pack",
    "prompt_of",
    "read_records",
    "tokenize",
]
