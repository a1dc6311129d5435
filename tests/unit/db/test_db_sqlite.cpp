// The SQLite layer: the one error checker, statements, transactions.
#include <sqlite3.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include <gtest/gtest.h>

#include "db/sqlite.hpp"

namespace test_db_sqlite {
using namespace attntune;
using sqlite::Connection;
using sqlite::Statement;
using sqlite::Transaction;

namespace {

Connection memory_db() {
  Connection db = Connection::open(":memory:", SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  db.exec("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT UNIQUE, x REAL, data BLOB)");
  return db;
}

std::int64_t count(const Connection& db) {
  Statement st(db, "SELECT count(*) FROM t");
  st.step();
  return st.int64(0);
}

}  // namespace

TEST(Sqlite, ErrorNamesTheCallTheCodeAndTheMessage) {
  Connection db = memory_db();
  try {
    Statement st(db, "SELEC nonsense");
    FAIL() << "a syntax error was accepted";
  } catch (const SqliteError& e) {
    EXPECT_EQ(e.call(), "sqlite3_prepare_v2");
    EXPECT_EQ(e.primary_code(), SQLITE_ERROR);
    EXPECT_EQ(e.code(), ExitCode::kFailed);
    const std::string what = e.what();
    EXPECT_NE(what.find("sqlite3_prepare_v2"), std::string::npos) << what;
    EXPECT_NE(what.find("SQLITE_ERROR"), std::string::npos) << what;
    EXPECT_NE(what.find("syntax error"), std::string::npos) << what;
  }
}

TEST(Sqlite, ConstraintErrorsCarryTheExtendedCode) {
  Connection db = memory_db();
  Statement ins(db, "INSERT INTO t (name) VALUES (?1)");
  ins.bind("a").run();
  ins.reset();
  ins.bind("a");
  try {
    ins.run();
    FAIL() << "a duplicate of a UNIQUE column was accepted";
  } catch (const SqliteError& e) {
    EXPECT_EQ(e.call(), "sqlite3_step");
    EXPECT_EQ(e.result_code(), SQLITE_CONSTRAINT_UNIQUE);
    EXPECT_NE(std::string(e.what()).find("SQLITE_CONSTRAINT"), std::string::npos);
  }
  EXPECT_EQ(count(db), 1);
}

TEST(Sqlite, CorruptionIsBadInputLockedOrFullIsTheEnvironmentOtherErrorsAreFailures) {
  EXPECT_EQ(SqliteError("sqlite3_step", SQLITE_CORRUPT, "malformed", "x.db").code(), ExitCode::kBadInput);
  EXPECT_EQ(SqliteError("sqlite3_step", SQLITE_NOTADB, "not a db", "x.db").code(), ExitCode::kBadInput);
  EXPECT_EQ(SqliteError("sqlite3_step", SQLITE_CONSTRAINT, "constraint failed", "x.db").code(), ExitCode::kFailed);
  const SqliteError full("sqlite3_step", SQLITE_FULL, "database or disk is full", "x.db");
  EXPECT_EQ(full.code(), ExitCode::kEnvironment);
  EXPECT_NE(std::string(full.what()).find("no space left"), std::string::npos) << full.what();
  EXPECT_EQ(SqliteError("sqlite3_step", SQLITE_IOERR_WRITE, "disk I/O error", "x.db", EFBIG).code(),
            ExitCode::kEnvironment);
  const SqliteError busy("sqlite3_step", SQLITE_BUSY, "database is locked", "x.db");
  EXPECT_EQ(busy.code(), ExitCode::kEnvironment);
  EXPECT_NE(std::string(busy.what()).find("database 'x.db' is locked by another writer"), std::string::npos)
      << busy.what();
  EXPECT_STREQ(sqlite_code_name(SQLITE_IOERR_READ), "SQLITE_IOERR");
}

TEST(Sqlite, BindsAndReadsEveryType) {
  Connection db = memory_db();
  const std::string blob("\0\1\2\xff", 4);
  Statement ins(db, "INSERT INTO t (id, name, x, data) VALUES (?1, ?2, ?3, ?4)");
  ins.bind(std::int64_t{1} << 40, std::string("µs, \"quoted\""), 2.5, sqlite::Blob{blob}).run();
  ins.reset();
  ins.bind(7, std::nullopt, std::optional<double>{}, nullptr).run();
  Statement sel(db, "SELECT id, name, x, data FROM t ORDER BY id");
  ASSERT_TRUE(sel.step());
  EXPECT_EQ(sel.int64(0), 7);
  EXPECT_TRUE(sel.is_null(1));
  EXPECT_EQ(sel.text(1), "");
  EXPECT_EQ(sel.opt_real(2), std::nullopt);
  EXPECT_EQ(sel.blob(3), "");
  ASSERT_TRUE(sel.step());
  EXPECT_EQ(sel.int64(0), std::int64_t{1} << 40);
  EXPECT_EQ(sel.text(1), "µs, \"quoted\"");
  EXPECT_EQ(sel.opt_real(2), 2.5);
  EXPECT_EQ(sel.blob(3), blob);
  EXPECT_FALSE(sel.step());
}

TEST(Sqlite, TransactionRollsBackUnlessCommitted) {
  Connection db = memory_db();
  {
    Transaction tx(db);
    Statement(db, "INSERT INTO t (name) VALUES ('dropped')").run();
  }
  EXPECT_EQ(count(db), 0);
  try {
    Transaction tx(db);
    Statement(db, "INSERT INTO t (name) VALUES ('dropped too')").run();
    throw std::runtime_error("failure halfway");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(count(db), 0);
  {
    Transaction tx(db);
    Statement(db, "INSERT INTO t (name) VALUES ('kept')").run();
    tx.commit();
  }
  EXPECT_EQ(count(db), 1);
  // The connection is usable again: no transaction was left open.
  Transaction again(db);
  again.commit();
}

TEST(Sqlite, OpenWithoutCreateNeverCreatesAFile) {
  const std::string path = ::testing::TempDir() + "attntune-sqlite-absent.db";
  std::remove(path.c_str());
  EXPECT_THROW(Connection::open(path, SQLITE_OPEN_READWRITE), SqliteError);
  EXPECT_NE(::access(path.c_str(), F_OK), 0);
}

TEST(Sqlite, ReadsAColumnByTheNameTheQueryGivesIt) {
  Connection db = memory_db();
  Statement ins(db, "INSERT INTO t (name, x, data) VALUES (?1, ?2, ?3)");
  ins.bind("a", 2.5, sqlite::Blob{"\x01\x02"}).run();
  // Columns added or reordered in a query shift no reader: each is read by its AS name.
  Statement st(db, "SELECT 7 AS extra, t.x AS x, IFNULL(t.name, '') AS name, t.data AS data, NULL AS missing FROM t");
  ASSERT_TRUE(st.step());
  EXPECT_EQ(st.column("name"), 2);
  EXPECT_EQ(st.text("name"), "a");
  EXPECT_DOUBLE_EQ(st.real("x"), 2.5);
  EXPECT_EQ(st.int64("extra"), 7);
  EXPECT_EQ(st.blob("data"), "\x01\x02");
  EXPECT_TRUE(st.is_null("missing"));
  EXPECT_FALSE(st.opt_real("missing"));
  try {
    st.text("nmae");
    FAIL() << "a column that is not there was read";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("no result column 'nmae'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(extra, x, name, data, missing)"), std::string::npos) << e.what();
  }
}
}  // namespace test_db_sqlite
