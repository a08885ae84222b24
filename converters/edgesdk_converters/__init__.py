"""Workstation side of edgesdk."""
