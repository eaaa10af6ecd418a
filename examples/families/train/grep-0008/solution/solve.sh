#!/bin/bash
grep error lines.txt > result.txt
