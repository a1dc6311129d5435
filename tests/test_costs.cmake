# Start order for `ctest -j`: the longest tests first, so that on CI's two cores no long test starts
# last and runs alone (ctest runs tests in descending COST; without this file a clean build tree has no
# recorded costs and runs them in definition order, which put torch_ops' 160 s at the very end).
# Included by ctest after the discovered gtest tests (tests/CMakeLists.txt); a name that no longer
# exists is ignored. Seconds from a full run at -j2 on the 2-core machine (2026-12-03, b6c48c6):
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
  set_tests_properties("${name}" PROPERTIES COST "${seconds}")
endforeach()
