"""Pooled phones on a cluster: the DevicePool bridge (`bridge`), phone Leases (`leases`).

Above the device environment (`qpa.envs.device`) and beside the Harness: it imports the
contract, the environments and the CRD types, and is imported only by the CLI.
"""
