# Read by cpack before it builds the packages (CPACK_PROJECT_CONFIG_FILE, cmake/packaging.cmake).
if(CPACK_GENERATOR STREQUAL "DEB" AND NOT CPACK_TRAY_INSTALL_PREFIX STREQUAL "/usr")
  message(FATAL_ERROR "The Debian packages need a build configured with "
    "-DCMAKE_INSTALL_PREFIX=/usr (this one: ${CPACK_TRAY_INSTALL_PREFIX}), which gives "
    "Debian's library directory: tools/build-debs configures one.")
endif()
