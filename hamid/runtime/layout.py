"""Where things live: in the state directory and inside the container."""

CONTAINERS_DIR = "containers"  # state_dir/containers/<id>: a container's shared-region directory
RELEASED_DIR = "released"  # state_dir/released/<id>: poststop markers

SHIM_IN_CONTAINER = "/usr/local/vgpu/libvgpu.so"
PRELOAD_IN_CONTAINER = "/etc/ld.so.preload"
REGION_DIR_IN_CONTAINER = "/run/hamid"
REGION_FILE_IN_CONTAINER = REGION_DIR_IN_CONTAINER + "/vgpu.cache"
