"""Modules generated from proto/holdfast/v1/locks.proto by generate_proto.py: do not edit."""
