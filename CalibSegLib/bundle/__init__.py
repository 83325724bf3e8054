"""Model bundles: one ``*.calibseg`` file (a zip) that says everything needed to run a model.

Members (nothing else is allowed):

- ``bundle.json`` — :class:`BundleMetadata`: schema version, network name and kwargs, input
  channels, classes with names and colours, preprocessing, training method and
  hyper-parameters (incl. CRaC multipliers), temperature, data and split, validation and
  test metrics, the optional quality model (:mod:`CalibSegLib.quality`), the optional standard
  terminology of the classes (:mod:`CalibSegLib.terminology`) and statistics of the training
  inputs and of the network's features of them (:mod:`CalibSegLib.input_check`), library version,
  weights dtype and SHA-256 checksum.
- ``weights.safetensors`` — the state dict as plain tensors. Bundles never contain pickles,
  so loading one can never run code.

:func:`load_bundle` checks all of it and raises :class:`BundleError` with one sentence on
anything missing, corrupt or incompatible. Bundles are untrusted input: the loader bounds what
one can make it spend (member sizes from the zip directory, the network's size computed on
torch's meta device, weights streamed in pieces) before spending it, and refuses weights
holding NaN or infinite values.

The parts: ``schema.py`` is ``bundle.json`` (:class:`BundleMetadata`, its sections and checks,
parsed and validated once on load), ``ensemble.py`` its ``ensemble`` section (:class:`Ensemble` of
:class:`EnsembleMember`: where an ensemble's members came from); ``archive.py`` is the zip file (:func:`save_bundle`,
:func:`load_bundle`, :func:`read_metadata` without the weights, the resource limits and the streamed, hashed weights);
``model.py`` is a bundle in memory (:class:`Bundle`) and the network it declares, sized before it is built.
"""

from CalibSegLib import BUNDLE_SUFFIX
from CalibSegLib.bundle.archive import WEIGHTS_MEMBER, load_bundle, read_metadata, save_bundle
from CalibSegLib.bundle.ensemble import Ensemble, EnsembleMember
from CalibSegLib.bundle.model import Bundle
from CalibSegLib.bundle.schema import (METADATA_MEMBER, SCHEMA_VERSION, BundleError, BundleMetadata,
                                      member_metadata)

__all__ = ["SCHEMA_VERSION", "BUNDLE_SUFFIX", "METADATA_MEMBER", "WEIGHTS_MEMBER", "BundleError", "BundleMetadata",
           "member_metadata", "Ensemble", "EnsembleMember", "Bundle", "save_bundle", "load_bundle", "read_metadata"]
