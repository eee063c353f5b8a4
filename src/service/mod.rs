//! gRPC and HTTP surfaces.
