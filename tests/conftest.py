"""Test-suite root. The harness plugin (fixtures, leak guard) is loaded through its pytest11 entry point;
``pytester`` is enabled here because the plugin's own tests run inner pytest sessions."""

pytest_plugins = ["pytester"]
