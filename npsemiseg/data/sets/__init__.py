"""The built-in datasets, one registered ``DatasetDef`` class per file. Importing this package registers them in
the order ``dataset_names()`` lists them. A new dataset is one more file here, or anywhere imported before it is
used (``tests/test_dataset_plugin.py`` registers one from the tests); ``docs/datasets.md`` says how."""

# ruff: noqa: I001, F401  (the registration order is the import order)
from npsemiseg.data.sets import pascal
from npsemiseg.data.sets import cityscapes
from npsemiseg.data.sets import ade20k
from npsemiseg.data.sets import coco
from npsemiseg.data.sets import synthetic
from npsemiseg.data.sets import study
from npsemiseg.data.sets import folder
