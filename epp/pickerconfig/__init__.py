"""EndpointPickerConfig (`inference.networking.x-k8s.io/v1alpha1`, upstream's `--config-file` /
`--config-text`) translated into this EPP's settings: a loader and a table of plugin types
(DESIGN.md §1, §7). Pure: the entry point reads the file and hands the text in.
"""

from epp.pickerconfig.loader import API_VERSION, KIND, PickerConfig, PickerConfigError, load_picker_config
from epp.pickerconfig.plugins import NOT_IMPLEMENTED, PLUGIN_TYPES

__all__ = [
    "API_VERSION",
    "KIND",
    "NOT_IMPLEMENTED",
    "PLUGIN_TYPES",
    "PickerConfig",
    "PickerConfigError",
    "load_picker_config",
]
