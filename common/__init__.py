"""Pieces shared by two or more apexrl roles: errors, tensor codec, signatures, gRPC and metrics helpers."""
