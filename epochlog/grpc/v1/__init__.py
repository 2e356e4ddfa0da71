"""Generated from proto/epochlog/v1/epochlog.proto by scripts/gen_proto.sh: do not edit."""
