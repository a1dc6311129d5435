# Start order for `ctest -j`: the longest tests first, so that on CI's two cores no long test starts
# last and runs alone (ctest runs tests in descending COST; without this file a clean build tree has no
# recorded costs and runs them in definition order, which put torch_ops' 160 s at the very end).
# Read twice (tests/CMakeLists.txt): at configure time for the tests add_test and gtest_add_tests
# define (torch_ops, slurm_service, the reliability suite), and by ctest, as a test include file,
# for the tests gtest_discover_tests finds when ctest runs (which ctest defines only after its
# include files: the second reading alone left torch_ops last on a clean clone). A name that no
# longer exists is ignored either way. Seconds from a full run at -j2 on the 2-core machine (2026-12-03, b6c48c6):
# refresh from build/Testing/Temporary/CTestCostData.txt when the slowest tests change.
foreach(entry
    "torch_ops=160"
    "FlashBwdWgmmaBuild.EveryConfigBuildsWithFewSpills=108"
    "ReliabilityServeKills.SigkillAndSigtermOfServeAndItsWorkerAtEveryPhaseLoseAndDuplicateNothing=75"
    "RehashDb.ASpaceWithATunableTheTemplateDoesNotReadMovesTheResults=71"
    "FlashBwdMmaBuild.ASpreadBuildsOnEveryArch=65"
    "ExportNvcc.CompilesAsSharedLibraryWithCSymbolsAndChecksArguments=45"
    "FlashDecodeBuild.EveryOtherHeadDimsTightestConfigsCompileWithoutSpills=43"
    "BackwardVariants.VariantBuildsCompile=43"
    "FlashDecodeBuild.SplitHeadDimsCompileWithoutSpills=42"
    "ShippedPlan.HoldsAtLeast200DistinctProblemsThatTheShippedSpacesServe=40"
    "FlashFwdWgmmaBuild.WgUniformKeepsQsDescriptorsInUniformRegisters=40"
    "FlashFwdWgmmaSpace.OptionsAndLimitsAreConsistent=39"
    "ReliabilityFullDisk.FiftyPointsOfTuneServeMergeExportAndReportLoseNothingAndTheNextRunCompletes=37"
    "FlashFwdWgmmaBuild.OtherHeadDimsCompileOnEveryEntryPoint=35"
    "FlashBwdWgmmaBuild.WgSkewBuildsWithoutSpills=35"
    "FlashBwdWgmmaBuild.TmaLoadsBuildsWithoutSpills=32"
    "ExportWgmmaNvcc.CompilesForSm90aWithCSymbolsAndChecksArguments=35"
    "FlashFwdMmaBuild.EveryHeadDimCompilesOnEveryEntryPointWithoutSpills=32"
    "FlashFwdWgmmaBuild.FoldFmaJoinsOsRescaleToTheTileAddition=31"
    "BackwardVarlen.VarlenBuildsCompile=29"
    "ReliabilityHostileInputs.GeneratedInputsNeverCrashHangChangeTheDatabaseOrFailSilently=27"
    "FlashFwdWgmmaBuild.Fa4LoopBuildsAreClean=27"
    "slurm_service=26"
    "FlashDecodeWgmmaBuild.WgUniformKeepsTheDescriptorsInUniformRegisters=24"
    "torch_train_compare=23"
    "FlashFwdWgmmaBuild.PpPvPassesTheTurnOnUnderQk=23"
    "FlashDecodeWgmmaBuild.EveryScheduleCompilesWithoutSpills=23"
    "FlashFwdWgmmaBuild.KPermPacksPWithoutShuffles=22"
    "BackwardVarlen.SortedOrderBuildsCompile=22"
    "ReliabilityService.ReadersBesideServeNeverCostAWrite=21"
    )
  string(REPLACE "=" ";" pair "${entry}")
  list(GET pair 0 name)
  list(GET pair 1 seconds)
  if(NOT ATTNTUNE_COSTS_AT_CONFIGURE)
    set_tests_properties("${name}" PROPERTIES COST "${seconds}")  # (ctest ignores an unknown name)
  elseif(TEST "${name}")
    set_tests_properties("${name}" PROPERTIES COST "${seconds}")
  endif()
endforeach()
