#!/bin/bash
mv records.txt report.txt
