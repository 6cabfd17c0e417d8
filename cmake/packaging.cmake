# Debian packages of the libraries and tools, split as Debian splits jemalloc and mimalloc:
#   libtraymalloc0      runtime  libtraymalloc.so.0 (the SONAME) and .so.0.x.y
#   libtraymalloc-dev   dev      headers, libtraymalloc.a, the unversioned .so link, the .pc
#                                file and the CMake package
#   traymalloc-tools    tools    tray-run, tray-stats, tray-prof, tray-timeline
# Built by `cmake --build BUILD --target package` from a build configured with
# -DCMAKE_INSTALL_PREFIX=/usr (tools/build-debs does both); tests/package/run.sh checks them.
# Included from the top-level CMakeLists.txt, after the install rules.

set(TRAY_DEB_MAINTAINER "traymalloc developers <dev@traymalloc.invalid>")
set(TRAY_DEB_DIR ${CMAKE_CURRENT_BINARY_DIR}/debian)

# What Debian puts in every package's /usr/share/doc/<package>/: the copyright file and a
# changelog, compressed as Debian compresses them (gzip -9n: no name, no time stamp, so the same
# tree gives the same package). The changelog's date honours SOURCE_DATE_EPOCH.
string(TIMESTAMP TRAY_DEB_DATE "%a, %d %b %Y %H:%M:%S +0000" UTC)
configure_file(${CMAKE_CURRENT_LIST_DIR}/debian/changelog.in ${TRAY_DEB_DIR}/changelog @ONLY)
execute_process(COMMAND gzip -9nc ${TRAY_DEB_DIR}/changelog
                OUTPUT_FILE ${TRAY_DEB_DIR}/changelog.gz RESULT_VARIABLE tray_gzip_status)
if(NOT tray_gzip_status EQUAL 0)
  message(FATAL_ERROR "gzip of ${TRAY_DEB_DIR}/changelog failed: ${tray_gzip_status}")
endif()

set(TRAY_DEB_PACKAGES runtime libtraymalloc0 dev libtraymalloc-dev tools traymalloc-tools)
while(TRAY_DEB_PACKAGES)
  list(POP_FRONT TRAY_DEB_PACKAGES component package)
  string(TOUPPER ${component} upper)
  set(CPACK_DEBIAN_${upper}_PACKAGE_NAME ${package})
  # Only the package of the component installs these: a plain cmake --install leaves them out.
  install(FILES ${CMAKE_CURRENT_LIST_DIR}/debian/copyright ${TRAY_DEB_DIR}/changelog.gz
          DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${package}
          COMPONENT ${component} EXCLUDE_FROM_ALL)
endwhile()

set(CPACK_GENERATOR DEB)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime dev tools)
set(CPACK_PACKAGE_NAME traymalloc)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
# Packages built from the project's own tree: native Debian versions, without a revision.
set(CPACK_DEBIAN_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_MAINTAINER ${TRAY_DEB_MAINTAINER})
set(CPACK_DEBIAN_COMPRESSION_TYPE xz)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# A package's directories and files are root's, whoever builds it.
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_STRIP_FILES ON)
# Depends from the ELF files' needs (dpkg-shlibdeps, from dpkg-dev), and a shlibs file so that
# packages built against libtraymalloc.so.0 depend on libtraymalloc0 of this version or later.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")

set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION libs)
# ldconfig runs once at the end of dpkg's run, through libc-bin's trigger, and not from
# maintainer scripts, which CPack writes and the script after the build takes out.
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA ${CMAKE_CURRENT_LIST_DIR}/debian/triggers)
set(CPACK_POST_BUILD_SCRIPTS ${CMAKE_CURRENT_LIST_DIR}/debian/drop-ldconfig-scripts.cmake)
set(CPACK_DEBIAN_RUNTIME_DESCRIPTION
"segregated size-class malloc replacement
traymalloc replaces malloc, free, new and delete with per-thread pools of
fixed-size blocks, one per size class, and gives empty memory back to the
operating system.
.
This package holds the shared library, loaded by programs linked with it or
preloaded into any program (LD_PRELOAD=libtraymalloc.so.0, or tray-run from
traymalloc-tools). Debug mode, guarded sampling, statistics and heap profiles
are turned on at run time with TRAY_OPTIONS.")

set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libtraymalloc0 (= ${PROJECT_VERSION})")
set(CPACK_DEBIAN_DEV_DESCRIPTION
"segregated size-class malloc replacement - development files
traymalloc replaces malloc, free, new and delete with per-thread pools of
fixed-size blocks, one per size class.
.
This package holds what programs that link traymalloc need: the headers
(traymalloc.h and the C++ object pools and heaps of tray/), the static
library, the pkg-config file (pkg-config traymalloc) and the CMake package
(find_package(traymalloc), targets traymalloc::traymalloc,
traymalloc::traymalloc_static and traymalloc::traymalloc_headers).")

# Scripts alone: tray-run is bash, the viewers Python 3; tray-prof names code with nm
# (binutils); charts (tray-stats --chart, tray-timeline --out) need matplotlib, the rest not.
set(CPACK_DEBIAN_TOOLS_PACKAGE_ARCHITECTURE all)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_TOOLS_PACKAGE_DEPENDS "libtraymalloc0 (= ${PROJECT_VERSION}), python3, binutils")
set(CPACK_DEBIAN_TOOLS_PACKAGE_RECOMMENDS "python3-matplotlib")
set(CPACK_DEBIAN_TOOLS_DESCRIPTION
"run programs under traymalloc and read its statistics and profiles
traymalloc replaces malloc, free, new and delete with per-thread pools of
fixed-size blocks, one per size class.
.
This package holds tray-run, which runs a program with libtraymalloc.so.0
preloaded, and the viewers of what the library writes: tray-stats (statistics
dumps as tables, growth between two, charts), tray-prof (heap profiles: top
sites, differences, flame graphs) and tray-timeline (memory over time).")

# GNUInstallDirs gives Debian's multiarch libdir (lib/x86_64-linux-gnu) for the /usr prefix
# alone, and CPack installs into /usr whatever the build's prefix: a build for another prefix
# would put the libraries where Debian does not. cpack reads this file when it starts.
set(CPACK_TRAY_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_PROJECT_CONFIG_FILE ${CMAKE_CURRENT_LIST_DIR}/debian/check-prefix.cmake)

include(CPack)
