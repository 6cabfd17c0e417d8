# Run by cpack once the packages are built (CPACK_POST_BUILD_SCRIPTS, cmake/packaging.cmake).
# CPack writes a postinst and a postrm that call ldconfig into a package with a shared library
# under /usr/lib, and no setting turns them off; Debian runs ldconfig through the trigger the
# package already has (triggers), once per dpkg run, and lintian warns of the direct calls
# (maintscript-calls-ldconfig). This rebuilds libtraymalloc0 without the two scripts, after
# checking that they do nothing else.
foreach(deb IN LISTS CPACK_PACKAGE_FILES)
  if(NOT deb MATCHES "/libtraymalloc0_[^/]*\\.deb$")
    continue()
  endif()
  set(tree ${deb}.tree)
  file(REMOVE_RECURSE ${tree})
  execute_process(COMMAND dpkg-deb --raw-extract ${deb} ${tree} COMMAND_ERROR_IS_FATAL ANY)
  foreach(script postinst postrm)
    file(READ ${tree}/DEBIAN/${script} text)
    string(REGEX REPLACE "#!/bin/sh|set -e|if \\[ \"\\$1\" = \"(configure|remove)\" \\]; then|ldconfig|fi|[ \t\n]"
           "" rest "${text}")
    if(NOT rest STREQUAL "")
      message(FATAL_ERROR "${deb}: its ${script} does more than call ldconfig:\n${text}")
    endif()
    file(REMOVE ${tree}/DEBIAN/${script})
  endforeach()
  execute_process(COMMAND dpkg-deb --root-owner-group -Zxz --build ${tree} ${deb}
                  OUTPUT_QUIET COMMAND_ERROR_IS_FATAL ANY)
  file(REMOVE_RECURSE ${tree})
endforeach()
