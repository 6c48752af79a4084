//! composer-grpc
