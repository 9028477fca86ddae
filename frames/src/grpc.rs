//! TODO(frames): grpc codec — being written.
